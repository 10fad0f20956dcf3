"""The contract under fire: a seeded fault-injection checker on the real processes.

Clients publish, mark read and poll (plain, conditional, held) through nginx and the app's private
API while a nemesis injects faults on a schedule drawn from one seed; every operation and fault is
recorded with its start and end (time.monotonic) in a history, which the checker verifies against
the rules of docs/api.md, "The contract, as checked". `python -m fastpoll_testkit.contract --help`.
"""
