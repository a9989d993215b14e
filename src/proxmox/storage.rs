//! Container templates in a node's storage: listed from the storage's `vztmpl` content,
//! and fetched by the node itself with `download-url` (checksum and algorithm given, so the
//! node refuses a file that differs and keeps nothing), the task followed to its end and
//! the storage listed again.

use std::collections::BTreeMap;

use super::client::{ApiReader, NodeApi};
use super::error::ProxmoxError;
use super::tasks::follow;
use crate::resources::op::Deadline;
use crate::resources::template::{TemplateFact, TemplateSpec};

/// The templates of `storage`, by volume ID.
pub fn templates(
    api: &ApiReader,
    storage: &str,
) -> Result<BTreeMap<String, TemplateFact>, ProxmoxError> {
    let path = api.node_path(&format!("/storage/{storage}/content"));
    let data = api.get(&path, &[("content", "vztmpl")])?;
    Ok(data
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some((
                v["volid"].as_str()?.to_string(),
                TemplateFact {
                    size: v["size"].as_u64().unwrap_or(0),
                },
            ))
        })
        .collect())
}

/// Has the node download `spec` into its storage and waits for it; the template must be
/// listed afterwards; all of it by `deadline`.
pub fn download(
    api: &NodeApi,
    spec: &TemplateSpec,
    deadline: Deadline,
) -> Result<(), ProxmoxError> {
    let (storage, file) = spec.storage_and_file();
    let path = api.node_path(&format!("/storage/{storage}/download-url"));
    let upid = api.call(
        "POST",
        &path,
        &[
            ("content", "vztmpl"),
            ("filename", file),
            ("url", &spec.url),
            ("checksum", &spec.checksum),
            ("checksum-algorithm", &spec.checksum_algorithm),
        ],
    )?;
    follow(api, &upid, deadline)?;
    if templates(api, storage)?.contains_key(&spec.volume) {
        Ok(())
    } else {
        Err(ProxmoxError::Task {
            node: api.label.clone(),
            kind: format!("download {file}"),
            exitstatus: "OK".into(),
            log: format!(
                "but {} is not listed in storage `{storage}` afterwards",
                spec.volume
            ),
        })
    }
}
