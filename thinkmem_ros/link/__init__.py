"""What travels between the robot and the consolidator, used by both ends.

The experience record, the versioned wire protocol, security (CURVE keys and ZAP,
Ed25519 bundle signatures), the robot's durable spool, and the two ends of the transport:
``shipper`` (robot) and ``receiver`` (consolidator). Nothing here imports the robot node
or the consolidator; the receiver writes into whatever store the consolidator hands it.
"""
