//! The worked example of docs/ADDING_A_BACKEND.md passes the whole suite with one line.

mod toy;

weightbay_conformance::suite!(toy::HashMapHarness::default());
