//! sparkgate's configuration: one typed, validated `Config` built from the process environment,
//! a launcher-style `.env` file and the profile defaults, and the launch plan derived from it.
//!
//! Pure: no I/O beyond reading the env file it is pointed at. Every value knows its source.

mod build;
mod choice;
mod config;
mod dotenv;
mod error;
mod groups;
mod keys;
mod knobs;
mod load;
mod models;
mod passthrough;
mod plan;
mod profile;
mod reference;
mod render;
mod resolve;
mod rule;
mod secret;
mod section;
mod sectioned;
mod source;
mod spec;
mod swap;
mod tenancy;
mod vllm;
mod words;

pub use choice::UnknownWord;
pub use config::{
    AutoSpec, Config, Containers, DflashDraft, EngramPack, Gateway, Gpus, GroupRouting, HostNccl, ImageShip,
    KnownHosts, LoadOptions, LogFormat, NfsShare, Nic, Nodes, Ports, Preparation, QueuePolicy, RankEnvValue, Runtime,
    SchedulingPolicy, Secrets, Serving, Setting, SpecPolicy, Speculation, SshSettings, Storage, Supervision,
    WeightSync, Weights, Worker, ZfsDatasets,
};
pub use error::{ConfigError, InvalidValue};
pub use groups::{GroupConfig, SINGLE_GROUP};
pub use keys::{parse_keys_file, valid_name, ApiKey, KeyEntry, KeySettings, KeyText, KeysFileError, RequestClass};
pub use plan::{labels, ContainerSpec, LaunchPlan, Mount, NodeRole, RankPlan, Ulimit};
pub use profile::{ProfileId, ReasoningFacts};
pub use reference::{reference_markdown, settings_table};
pub use secret::{Secret, REDACTED};
pub use source::Source;
pub use spec::{
    default_max_num_seqs, seeded_throughput, Basis, SpecMethod, SpecMode, ThroughputPoint, ThroughputTable,
};
pub use swap::{Swap, SwapPolicy};
pub use tenancy::{FairCharge, KeyQuota, OtlpProtocol, QuotaMode, Reserve, Tenancy, TlsFiles, Tracing};
pub use vllm::{Fit, UpstreamVersion, VllmRelease};
