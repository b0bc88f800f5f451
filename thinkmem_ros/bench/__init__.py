"""thinkmem_ros.bench."""
