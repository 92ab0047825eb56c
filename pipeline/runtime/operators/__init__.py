"""The operators room: the executor side of every stateful operator and sink writer - one module per operator
(:mod:`.join`, :mod:`.aggregate`, :mod:`.dedup`, :mod:`.window`, :mod:`.process`, :mod:`.sink_writer`) over one
shared task skeleton (:mod:`.task`), the operator registry (:mod:`.registry`), the state-access port and its
backends, the round parameters the tasks read, the task reports' codec and the dead letters they write. It imports
neither :mod:`pipeline.runtime.driver` nor :mod:`pipeline.runtime.spark`."""
