"""Everything that runs on the robot: the ROS 2 node shell and its plain-Python parts.

``node`` is the only module that needs rclpy for its logic; the situation buffer, config,
diagnostics, hot-swap, thinking gates, memory control, recall client, bundle receiver and
experience builder are plain Python, unit-tested without ROS. Robot code never imports
torch, training code or the consolidator (checked by the import contracts in
``.importlinter``).
"""
