//! The local backend passes the conformance suite with every capability it declares.

mod support;

weightbay_conformance::suite!(support::Local::default());
