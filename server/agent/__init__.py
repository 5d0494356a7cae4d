"""Agent runs: the loop, the model interface, tools and history."""
