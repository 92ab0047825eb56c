"""The Spark runtime of Epochal: session, routing, operator tasks, rounds and the job runner."""
