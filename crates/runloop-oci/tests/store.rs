//! Images from layouts into the store: digests checked, layers of every
//! compression unpacked in order, cached per manifest digest, unpacked once
//! when asked for at the same time, and refused when anything is off.

use std::fs;
use std::io::Write;
use std::sync::Arc;

use runloop_oci::digest::Digest;
use runloop_oci::image::{Image, host_arch};
use runloop_oci::layout::Layout;
use runloop_oci::store::{Store, UnpackLimits};
use runloop_testkit::oci::{self, GZIP, TAR, ZSTD};
use serde_json::json;

const LIMITS: UnpackLimits = UnpackLimits {
    max_bytes: 1 << 30,
    max_entries: 100_000,
};

/// A layer of `files` (path, content), each mode 0755.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let files: Vec<(&str, u32, &[u8])> = files
        .iter()
        .map(|(path, data)| (*path, 0o755, *data))
        .collect();
    oci::tar(&files)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ruzstd::encoding::compress(bytes, &mut out, ruzstd::encoding::CompressionLevel::Fastest);
    out
}

/// Writes an image (layers given as media type and blob) into `layout`
/// under `name`; returns the manifest's digest.
fn image(layout: &Layout, name: &str, layers: &[(&str, Vec<u8>)], arch: &str) -> Digest {
    let config = oci::config(
        arch,
        json!({"Entrypoint": ["/bin/agent"], "Cmd": ["--port", "8080"], "Env": ["A=1"], "WorkingDir": "/srv"}),
    );
    let layers: Vec<(&str, &[u8])> = layers
        .iter()
        .map(|(media_type, blob)| (*media_type, blob.as_slice()))
        .collect();
    let (digest, _) = oci::write_image(layout.dir(), name, &config, &layers);
    digest.parse().expect("a digest")
}

#[tokio::test]
async fn layers_of_every_compression_unpack_in_order_and_are_cached() {
    // Unpacking sets each entry's owner: only root may.
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp");
    let layout = Arc::new(Layout::create(scratch.path().join("layout")).expect("layout"));
    // Two zstd frames in one layer: a concatenation is still one stream.
    let mut two_frames = zstd(&tar_of(&[("c", b"zstd")])[..512]);
    two_frames.extend(zstd(&tar_of(&[("c", b"zstd")])[512..]));
    let digest = image(
        &layout,
        "latest",
        &[
            (TAR, tar_of(&[("a", b"plain"), ("b", b"below")])),
            (GZIP, gzip(&tar_of(&[("b", b"gzip wins")]))),
            (ZSTD, two_frames),
        ],
        host_arch(),
    );
    let image = Image::from_layout(&layout).expect("image");
    assert_eq!(image.digest, digest);
    assert_eq!(image.layers.len(), 3);
    assert_eq!(
        image.process.args,
        ["/bin/agent", "--port", "8080"].map(String::from)
    );
    assert_eq!(image.process.cwd, "/srv");
    assert_eq!(image.process.env, ["A=1"]);

    let store = Arc::new(Store::open(scratch.path().join("store"), LIMITS).expect("store"));
    // Asked for twice at once: one unpack, the same result.
    let (first, second) =
        tokio::join!(store.unpack(&layout, &image), store.unpack(&layout, &image));
    let (unpacked, second) = (first.expect("unpacked"), second.expect("unpacked"));
    assert_eq!(second.rootfs, unpacked.rootfs);
    assert!(
        unpacked.fresh ^ second.fresh,
        "exactly one of them unpacked it"
    );
    assert_eq!(fs::read(unpacked.rootfs.join("a")).expect("a"), b"plain");
    assert_eq!(
        fs::read(unpacked.rootfs.join("b")).expect("b"),
        b"gzip wins"
    );
    assert_eq!(fs::read(unpacked.rootfs.join("c")).expect("c"), b"zstd");
    let images: Vec<_> = fs::read_dir(store.dir().join("images"))
        .expect("images")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(images, [format!("sha256-{}", digest.hex())]);

    // Cached: a layout whose blobs are gone still serves the unpacked image.
    fs::remove_dir_all(layout.dir().join("blobs")).expect("blobs removed");
    let again = store.unpack(&layout, &image).await.expect("cached");
    assert_eq!(again.rootfs, unpacked.rootfs);
    assert!(!again.fresh);
}

#[tokio::test]
async fn a_tampered_layer_is_refused_and_leaves_no_image() {
    let scratch = tempfile::tempdir().expect("temp");
    let layout = Arc::new(Layout::create(scratch.path().join("layout")).expect("layout"));
    let layer = tar_of(&[("a", b"honest")]);
    image(&layout, "latest", &[(TAR, layer.clone())], host_arch());
    let image = Image::from_layout(&layout).expect("image");
    let blob = layout.blob_path(&image.layers[0].digest);
    let mut tampered = layer.clone();
    let at = tampered
        .windows(6)
        .position(|w| w == b"honest")
        .expect("content");
    tampered[at..at + 6].copy_from_slice(b"hacked");
    fs::write(&blob, &tampered).expect("tamper");
    let store = Store::open(scratch.path().join("store"), LIMITS).expect("store");
    let error = store.unpack(&layout, &image).await.expect_err("refused");
    assert_eq!(
        error.to_string(),
        format!(
            "blob {} does not match its digest: its content hashes to {}",
            image.layers[0].digest,
            Digest::of(&tampered)
        )
    );
    assert_eq!(
        fs::read_dir(store.dir().join("images"))
            .expect("images")
            .count(),
        0,
        "no image, and no temporary directory, is left"
    );
}

#[test]
fn manifests_and_indexes_are_checked_before_use() {
    let scratch = tempfile::tempdir().expect("temp");
    let layout = Layout::create(scratch.path().join("layout")).expect("layout");
    assert_eq!(
        Image::from_layout(&layout).expect_err("empty").to_string(),
        format!("the index lists no image for linux/{}", host_arch())
    );
    let manifest = image(&layout, "one", &[(TAR, tar_of(&[]))], host_arch());
    // A manifest blob that no longer matches its digest.
    let path = layout.blob_path(&manifest);
    let mut bytes = fs::read(&path).expect("manifest");
    bytes.push(b' ');
    fs::write(&path, &bytes).expect("tamper");
    assert_eq!(
        Image::from_layout(&layout)
            .expect_err("tampered")
            .to_string(),
        format!(
            "blob {manifest} is {} bytes; its descriptor says {}",
            bytes.len(),
            bytes.len() - 1
        )
    );
    // Two images for this platform: ambiguous.
    image(
        &layout,
        "two",
        &[(TAR, tar_of(&[("x", b"x")]))],
        host_arch(),
    );
    assert!(
        Image::from_layout(&layout)
            .expect_err("ambiguous")
            .to_string()
            .starts_with("the index lists 2 images for linux/")
    );
    // An image for another architecture.
    let other = Layout::create(scratch.path().join("other")).expect("layout");
    image(&other, "latest", &[(TAR, tar_of(&[]))], "s390x");
    assert_eq!(
        Image::from_layout(&other)
            .expect_err("platform")
            .to_string(),
        format!(
            "the image is for linux/s390x; this host runs linux/{}",
            host_arch()
        )
    );
    assert!(
        Layout::open(scratch.path())
            .expect_err("not a layout")
            .to_string()
            .contains("is not an OCI image layout: cannot read its oci-layout file")
    );
}

/// The image directories of a store, by name.
fn unpacked_names(store: &Store) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(store.dir().join("images"))
        .expect("images")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn name_of(digest: &Digest) -> String {
    format!("sha256-{}", digest.hex())
}

#[tokio::test]
async fn a_store_over_its_bound_sheds_the_oldest_unheld_image_and_keeps_a_held_one() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp");
    let store = Store::open(scratch.path().join("store"), LIMITS).expect("store");
    // The oldest as a pull leaves it: its blobs in the store's own layout,
    // named in its index; a blob no image names beside it.
    let pulled = store.layout();
    let oldest = image(
        pulled,
        "registry.example/old:1",
        &[(TAR, tar_of(&[("old", &[1u8; 40_000][..])]))],
        host_arch(),
    );
    let orphan = pulled.put(b"a blob a failed pull left").expect("orphan");
    let outside = Arc::new(Layout::create(scratch.path().join("layout")).expect("layout"));
    let held = image(
        &outside,
        "held",
        &[(TAR, tar_of(&[("held", &[2u8; 40_000][..])]))],
        host_arch(),
    );
    let newest = image(
        &outside,
        "new",
        &[(TAR, tar_of(&[("new", &[3u8; 40_000][..])]))],
        host_arch(),
    );
    let load = |layout: &Layout, digest: &Digest| Image::load(layout, digest, None).expect("image");
    // Used in this order; file times are coarse, so a pause between.
    let first = store
        .unpack(pulled, &load(pulled, &oldest))
        .await
        .expect("oldest");
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let holder = store
        .unpack(&outside, &load(&outside, &held))
        .await
        .expect("held");
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let last = store
        .unpack(&outside, &load(&outside, &newest))
        .await
        .expect("newest");
    drop(last);
    let size = |digest: &Digest| {
        runloop_oci::gc::du(&store.dir().join("images").join(name_of(digest))).expect("du")
    };
    let bound = size(&held) + size(&newest);

    // Dry: the oldest (and the orphan) would go; nothing does.
    let dry = runloop_oci::gc::collect(store.dir(), bound, true).expect("dry");
    assert_eq!(
        dry.removed
            .iter()
            .map(|c| c.digest.clone())
            .collect::<Vec<_>>(),
        [oldest.to_string()]
    );
    assert_eq!(dry.orphans.0, 1);
    assert!(dry.within() && dry.held.is_empty(), "{dry:?}");
    assert_eq!(unpacked_names(&store).len(), 3);
    assert!(pulled.has_blob(&oldest) && pulled.has_blob(&orphan));

    // Shed: the oldest goes, roots, blobs and index entry; the others stay.
    let shed = runloop_oci::gc::collect(store.dir(), bound, false).expect("collect");
    assert_eq!(shed.removed, dry.removed);
    assert!(shed.within(), "{shed:?}");
    assert!(shed.after < shed.before);
    let mut kept = vec![name_of(&held), name_of(&newest)];
    kept.sort();
    assert_eq!(unpacked_names(&store), kept);
    assert!(!pulled.has_blob(&oldest) && !pulled.has_blob(&orphan));
    assert!(pulled.index().expect("index").manifests().is_empty());

    // Nothing fits in 0 bytes, but a held image stays: the store stays
    // over its bound, and says which image held it there.
    let over = runloop_oci::gc::collect(store.dir(), 0, false).expect("collect");
    assert_eq!(
        over.removed
            .iter()
            .map(|c| c.digest.clone())
            .collect::<Vec<_>>(),
        [newest.to_string()]
    );
    assert_eq!(
        over.held
            .iter()
            .map(|c| c.digest.clone())
            .collect::<Vec<_>>(),
        [held.to_string()]
    );
    assert!(!over.within());
    assert_eq!(unpacked_names(&store), [name_of(&held)]);
    assert!(holder.rootfs.join("held").is_file());

    // Let go of, it goes too.
    drop(holder);
    let last = runloop_oci::gc::collect(store.dir(), 0, false).expect("collect");
    assert!(last.within(), "{last:?}");
    assert!(unpacked_names(&store).is_empty());
}

#[tokio::test]
async fn a_bounded_store_sheds_what_no_run_holds_after_each_new_image() {
    if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
        return;
    }
    let scratch = tempfile::tempdir().expect("temp");
    let store = Store::open(scratch.path().join("store"), LIMITS)
        .expect("store")
        .with_max_size(Some(0));
    let layout = Arc::new(Layout::create(scratch.path().join("layout")).expect("layout"));
    let one = image(
        &layout,
        "one",
        &[(TAR, tar_of(&[("one", b"1")]))],
        host_arch(),
    );
    let two = image(
        &layout,
        "two",
        &[(TAR, tar_of(&[("two", b"2")]))],
        host_arch(),
    );
    let load = |digest: &Digest| Image::load(&layout, digest, None).expect("image");
    let first = store.unpack(&layout, &load(&one)).await.expect("one");
    drop(first);
    let second = store.unpack(&layout, &load(&two)).await.expect("two");
    // The collection runs beside: it takes the first, and never the one held.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while unpacked_names(&store) != [name_of(&two)] {
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?}",
            unpacked_names(&store)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(second.rootfs.join("two").is_file());
    store.stop().await;
}
