pub mod machine_refresh;
