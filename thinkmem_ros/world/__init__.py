"""thinkmem_ros.world."""
