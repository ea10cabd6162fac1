-- Fixture for tests/runner_spec.lua: names and messages with bytes that are not UTF-8. 0 passed, 1 failed.
it("has \255 in its name", function() error("a message with \254\192 in it") end)
