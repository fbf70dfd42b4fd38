"""Fixtures of the task-5a tests: one torch thread and real gloo process groups, as the language
tasks' tests have them."""

from tests.language.conftest import on_ranks, one_thread  # noqa: F401  (fixtures)
