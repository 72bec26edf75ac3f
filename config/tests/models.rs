//! MODELS: each model a whole configuration of its own profile, its MODELS_FILE section above
//! the shared layers; what would run one model with the other's settings is refused.

mod common;

use common::Fixture;
use sparkgate_config::{Config, ProfileId, SwapPolicy};

#[test]
fn each_model_keeps_its_profiles_defaults_and_its_own_section() {
    let f = Fixture::new(Some(
        "MODELS=glm-5.3-flash,deepseek-v4.1-flash\nMODELS_FILE=models.env\nLOG_DIR=/var/log/sg\nMAX_NUM_SEQS=2\n",
    ));
    std::fs::write(
        f.dir.path().join("models.env"),
        "[deepseek-v4.1-flash]\nMODEL_ALIASES=ds\nSPEC_METHOD=none\n[glm-5.3-flash]\nIMAGE=glm:local\n",
    )
    .unwrap();
    let base = f.config();
    // The first of MODELS is the default: the gateway's own configuration is its.
    assert_eq!(base.profile, ProfileId::Glm53Flash);
    assert_eq!(
        base.gateway.models,
        [ProfileId::Glm53Flash, ProfileId::DeepSeekV41Flash]
    );
    assert_eq!(base.gateway.swap.policy, SwapPolicy::OnDemand);
    let models = Config::load_groups(&f.options()).unwrap();
    type Seen<'a> = (&'a str, &'a str, &'a str, String, Vec<String>, String, u32);
    let seen: Vec<Seen> = models
        .iter()
        .map(|m| {
            let c = &m.config;
            (
                m.name.as_str(),
                c.serving.served_model_name.as_str(),
                c.serving.image.as_str(),
                c.speculation.active.to_string(),
                c.gateway.model_aliases.clone(),
                c.supervision.log_dir.display().to_string(),
                c.speculation.active_mode().max_num_seqs,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "glm-5.3-flash",
                "GLM-5.3-Flash-EXL3",
                "glm:local",
                "dflash".to_owned(),
                vec![],
                "/var/log/sg/glm-5.3-flash".to_owned(),
                2
            ),
            (
                "deepseek-v4.1-flash",
                "DeepSeek-v4.1-Flash-EXL3",
                "ghcr.io/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw",
                "none".to_owned(),
                vec!["ds".to_owned()],
                "/var/log/sg/deepseek-v4.1-flash".to_owned(),
                2
            ),
        ]
    );
    // Each model's plan is its own: its image and its container names.
    let names: Vec<String> = models.iter().map(|m| m.config.containers.head_name.clone()).collect();
    assert_eq!(names, ["glm53-exl3-head", "dsv41-exl3-head"]);
}

#[test]
fn a_setting_that_differs_by_profile_set_for_every_model_is_refused() {
    let f = Fixture::new(Some("MODELS=deepseek-v4.1-flash,glm-5.3-flash\nIMAGE=mine:1\n")).env("SPEC_METHOD", "none");
    let err = Config::load_groups(&f.options()).unwrap_err().to_string();
    for expected in [
        "IMAGE=\"mine:1\"",
        "SPEC_METHOD=\"none\" (from process environment)",
        "differs by profile, so with MODELS it is set per model, in its MODELS_FILE `[profile]` section",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
}

#[test]
fn models_file_sections_are_checked() {
    let f = Fixture::new(Some("MODELS=deepseek-v4.1-flash,glm-5.3-flash\nMODELS_FILE=m.env\n"));
    std::fs::write(
        f.dir.path().join("m.env"),
        "[glm-5.3-flash]\nPORT=9000\nQUEUE_DEPTH=4\nMODEL_ALIASES=glm\nSERVED_MODEL_NAME=DeepSeek-v4.1-Flash-EXL3\n[other]\nTP=2\n",
    )
    .unwrap();
    let err = Config::load_groups(&f.options()).unwrap_err().to_string();
    for expected in [
        "[glm-5.3-flash] PORT=\"9000\"",
        "is shared by every model: set it outside MODELS_FILE",
        "[glm-5.3-flash] QUEUE_DEPTH=\"4\"",
        "is the gateway's, shared by every model",
        "[other]",
        "must name a model of MODELS (deepseek-v4.1-flash, glm-5.3-flash)",
        "[glm-5.3-flash] SERVED_MODEL_NAME=\"DeepSeek-v4.1-Flash-EXL3\"",
        "must differ from every other model's",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
    assert!(
        !err.contains("MODEL_ALIASES"),
        "a model's own aliases are its to set: {err}"
    );
}

#[test]
fn models_refuse_groups_a_second_default_and_unknown_profiles() {
    let f = Fixture::new(Some(
        "MODELS=deepseek-v4.1-flash,glm-5.3-flash\nGROUPS_FILE=g.env\nPROFILE=glm-5.3-flash\n",
    ));
    std::fs::write(f.dir.path().join("g.env"), "[a]\n").unwrap();
    let err = Config::load_groups(&f.options()).unwrap_err().to_string();
    assert!(err.contains("cannot be combined with GROUPS_FILE"), "{err}");
    assert!(err.contains("names a model other than the first of MODELS"), "{err}");
    let err = Fixture::new(Some("MODELS=deepseek-v4.1-flash,qwen,deepseek-v4.1-flash\n"))
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`qwen` must be one of: deepseek-v4.1-flash, glm-5.3-flash"),
        "{err}"
    );
    assert!(err.contains("`deepseek-v4.1-flash` must be named once"), "{err}");
}

#[test]
fn without_models_one_group_as_before() {
    let f = Fixture::new(Some("MODELS=\n"));
    let groups = Config::load_groups(&f.options()).unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].name, "main");
    assert!(groups[0].config.gateway.models.is_empty());
}
