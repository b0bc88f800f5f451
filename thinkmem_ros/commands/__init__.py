"""Sub-commands of the ``thinkmem`` command, one module per verb."""
