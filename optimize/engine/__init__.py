"""Running the work: a recipe's steps to a verified, measured candidate (`pipeline`), tasks as values
(`work`), executors in process, in worker processes or on Ray (`executors`, `ray_executor`), one model's
sweep planned and assembled (`runs`, `sweeps`), many driven together (`schedule`, `zoo`), single recipes
and debug (`single`, `debug`), and the content-addressed result cache on any fsspec store (`cache`,
`storage`)."""
