"""thinkmem_ros.consolidator."""
