"""thinkmem_ros: a learned, situation-conditioned thinking policy for ROS 2 robots.

Laid out by role (see docs/architecture.md): ``robot`` runs on the robot, ``link`` is what
both ends share on the wire, ``consolidator`` runs offboard; ``policy``, ``world`` and
``core`` sit below them, ``commands``, ``bench`` and ``demo`` on top. Robot-side code
imports numpy, onnxruntime and pyzmq only; torch is an offboard training dependency.
"""

__version__ = "0.1.0"
