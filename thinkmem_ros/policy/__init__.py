"""thinkmem_ros.policy."""
