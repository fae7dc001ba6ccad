//! The object-store backend passes the conformance suite on object_store's InMemory and
//! LocalFileSystem stores and on the local S3, GCS and Azure servers.

mod support;

fn main() {
    weightbay_conformance::Suite::new()
        .backend("in_memory", support::InMemory)
        .backend("local_file_system", support::ByUrl::local_fs())
        .backend("s3", support::ByUrl::s3())
        .backend("gcs", support::ByUrl::gcs())
        .backend("azure", support::ByUrl::azure())
        .run()
}
