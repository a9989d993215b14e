//! Handlebars templates and roles, loaded as data.
