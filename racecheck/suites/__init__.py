"""Suites and their arms: the race catalogue (scenarios/*/scenario.toml) and a project's own [tool.racecheck] suite."""
