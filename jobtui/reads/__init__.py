"""What is read of the queue: the backlog, each queue and type at a glance, the snapshot of
the six measures, the lists and searches of jobs, and what the probes answer."""
