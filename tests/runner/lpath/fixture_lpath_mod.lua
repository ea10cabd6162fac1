-- A module found through --lpath (tests/runner_spec.lua).
return { where = "lpath" }
