//! Test support shared by sparkgate's integration tests.
