"""Scheduler integrations: hooks that publish job events and logs, actuators that apply
decisions (Slurm: ``sibylla slurm epilog`` and ``sibylla slurm actuator``)."""
