//! One file per kind of resource.
