//! The object-store backend passes the conformance suite on object_store's InMemory and
//! LocalFileSystem stores and on the local S3 and GCS servers.

mod support;

mod in_memory {
    weightbay_conformance::suite!(super::support::InMemory);
}

mod local_file_system {
    weightbay_conformance::suite!(super::support::ByUrl::local_fs());
}

mod s3 {
    weightbay_conformance::suite!(super::support::ByUrl::s3());
}

mod gcs {
    weightbay_conformance::suite!(super::support::ByUrl::gcs());
}
