"""fastpoll's test and bench kit: the one stack harness (stack), process control (procs), raw HTTP
(rawhttp), the load generator (loadgen) and the status command (status). Installed into the
project's venv in editable mode (`make venv`); every suite imports it by name."""
