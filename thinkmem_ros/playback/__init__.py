"""Recorded signals for the robot: rosbag2 files (read/written with ``rosbags``) and a player.

``bag_files`` reads and writes MCAP/sqlite3 rosbag2 recordings of the node's input topics;
``player`` republishes a recording on real DDS so the node cannot tell it from sensors.
"""
