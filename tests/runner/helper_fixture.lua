-- A --helper for tests/runner_spec.lua: runs before the specs, on every rank.
rawset(_G, "FIXTURE_HELPER", "ran")
