"""thinkmem_ros: a learned, situation-conditioned thinking policy for ROS 2 robots.

Robot-side modules (this package minus ``policy.model``/``policy.train``/``policy.export``,
``consolidator.retrain`` and ``bench``) import with numpy, onnxruntime and pyzmq only;
torch is an offboard training dependency.
"""

__version__ = "0.1.0"
