"""Running on this machine: starting reward/rollout services as local processes, the terminal progress bar."""
