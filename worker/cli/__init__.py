"""For operators at a shell: the ``aidawork`` command and every subcommand.
The top of ``worker``: it may import every other package of it, and nothing imports it.
Runs in any process the command starts (worker, beat, api, webhooks, flower)."""
