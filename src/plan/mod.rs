//! The plan: a value that `plan` and `check` print and `apply` executes.
