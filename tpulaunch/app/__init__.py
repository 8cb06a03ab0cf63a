"""The application layer: what the verbs do, as plain functions over the floors below (the gate, a run's record,
`train`'s and `run`'s wiring, what `status` reads). No click and no printing: each takes what to say through a
callback and returns data; the command line (`cli/`) parses the options, calls one of these and renders."""
