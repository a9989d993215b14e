//! From inventory to plan: desired resources per target, reads, diff.
