//! OCI image layouts for the tests, written as another tool (skopeo,
//! buildah) would write them: blobs named by their sha256, an image
//! manifest and configuration, an `index.json` that names each image. The
//! store under test reads them as it reads any layout; none of its own
//! code writes them (the testkit cannot import `runloop-oci`, whose tests
//! use it).

use std::fs;
use std::path::Path;

use serde_json::{Value, json};

/// The media type of an uncompressed layer.
pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// The media type of a gzipped layer.
pub const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The media type of a zstd-compressed layer.
pub const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// The annotation under which `index.json` names an image.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A tar archive of regular files: (path in the image, mode, content),
/// owned by root, all of one modification time, so the same files make
/// the same bytes (and digest) every time.
pub fn tar(files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .expect("a tar entry");
    }
    builder.into_inner().expect("a tar archive")
}

/// An image configuration for `architecture` on Linux, whose process is
/// `process` (its `Entrypoint`, `Cmd`, `Env`, `WorkingDir`…).
pub fn config(architecture: &str, process: Value) -> Value {
    json!({
        "architecture": architecture,
        "os": "linux",
        "config": process,
        "rootfs": {"type": "layers", "diff_ids": []},
    })
}

/// The digest of `bytes`: `sha256:` and 64 lowercase hex digits.
pub fn digest(bytes: &[u8]) -> String {
    crate::sha256(bytes)
}

/// Makes the layout at `dir` (its `oci-layout` file, an empty index, the
/// blob directory) where it is not one yet.
pub fn create(dir: &Path) {
    fs::create_dir_all(dir.join("blobs/sha256")).expect("the layout's blob directory");
    let marker = dir.join("oci-layout");
    if !marker.exists() {
        fs::write(marker, br#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
    }
    let index = dir.join("index.json");
    if !index.exists() {
        let empty = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [],
        });
        fs::write(index, empty.to_string()).expect("index.json");
    }
}

/// Writes `bytes` as a blob of the layout at `dir`; its digest.
pub fn put(dir: &Path, bytes: &[u8]) -> String {
    let digest = digest(bytes);
    let hex = digest.trim_start_matches("sha256:");
    fs::write(dir.join("blobs/sha256").join(hex), bytes).expect("a blob");
    digest
}

/// Writes an image into the layout at `dir` (made if need be) under
/// `name` (replacing an image of that name): its configuration `config`
/// and its `layers`, each (media type, bytes). Returns the manifest's
/// digest and bytes.
pub fn write_image(
    dir: &Path,
    name: &str,
    config: &Value,
    layers: &[(&str, &[u8])],
) -> (String, Vec<u8>) {
    create(dir);
    let config = serde_json::to_vec(config).expect("a configuration");
    let descriptor = |media_type: &str, bytes: &[u8]| json!({"mediaType": media_type, "digest": put(dir, bytes), "size": bytes.len()});
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": layers
            .iter()
            .map(|(media_type, bytes)| descriptor(media_type, bytes))
            .collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).expect("a manifest");
    let digest = put(dir, &manifest);
    index(dir, name, &digest, manifest.len());
    (digest, manifest)
}

/// Names the manifest `digest` (`size` bytes, in the layout) `name` in
/// the layout's `index.json`, in place of any image of that name.
pub fn index(dir: &Path, name: &str, digest: &str, size: usize) {
    let path = dir.join("index.json");
    let mut index: Value =
        serde_json::from_slice(&fs::read(&path).expect("index.json")).expect("index JSON");
    let manifests = index["manifests"].as_array_mut().expect("a manifest list");
    manifests.retain(|entry| entry["annotations"][REF_NAME] != name);
    manifests.push(json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest,
        "size": size,
        "annotations": {REF_NAME: name},
    }));
    fs::write(&path, index.to_string()).expect("index.json");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_its_blobs_and_one_entry_of_the_index_by_name() {
        let dir = std::env::temp_dir().join(format!("runloop-testkit-oci-{}", std::process::id()));
        let layer = tar(&[("a", 0o644, b"a")]);
        let process = json!({"Entrypoint": ["/a"]});
        let (first, _) = write_image(
            &dir,
            "latest",
            &config("amd64", process.clone()),
            &[(TAR, &layer)],
        );
        let (second, manifest) =
            write_image(&dir, "latest", &config("arm64", process), &[(TAR, &layer)]);
        assert_ne!(first, second);
        assert_eq!(digest(&manifest), second);
        let blob = |digest: &str| {
            dir.join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"))
        };
        assert_eq!(
            fs::read(blob(&second)).expect("the manifest blob"),
            manifest
        );
        assert_eq!(
            fs::read(blob(&digest(&layer))).expect("the layer blob"),
            layer
        );
        // One image of the name: the second replaced the first.
        let index: Value =
            serde_json::from_slice(&fs::read(dir.join("index.json")).expect("index"))
                .expect("JSON");
        let entries = index["manifests"].as_array().expect("a list");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["digest"], second.as_str());
        assert_eq!(entries[0]["annotations"][REF_NAME], "latest");
        fs::remove_dir_all(&dir).expect("removed");
    }
}
