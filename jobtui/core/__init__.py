"""What changes the queue: enqueue, claim and outcomes, the operator's actions, queue
levers, schedules, handlers and maintenance, each built as named statements of the kernel."""
