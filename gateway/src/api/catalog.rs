//! The models a gateway serves (MODELS: several, one loaded at a time; else one): which model a
//! request names, by its served name or an alias, read where vLLM would read it (a literal
//! `extra_body.model` overrides the top level, as the OpenAI SDK flattens it), and each model's
//! normaliser — its profile's template rules, aliases and effort map.

use serde_json::{Map, Value};
use sparkgate_config::VllmRelease;

use crate::api::error::GatewayError;
use crate::api::family::Api;
use crate::api::models::{alias_matches, ModelId, MAX_MODELS};
use crate::api::normalize::{Fields, Normalized, Normalizer};

/// Every model, in MODELS order.
#[derive(Debug)]
pub(crate) struct Catalog {
    models: Vec<Normalizer>,
}

/// How deep `extra_body` is looked into for `model` (normalisation's own bound).
const EXTRA_BODY_DEPTH: usize = 4;

impl Catalog {
    pub(crate) fn new(models: Vec<Normalizer>) -> Self {
        assert!((1..=MAX_MODELS).contains(&models.len()), "1 to {MAX_MODELS} models");
        Self { models }
    }

    pub(crate) fn len(&self) -> usize {
        self.models.len()
    }

    pub(crate) fn get(&self, id: ModelId) -> &Normalizer {
        &self.models[id.index()]
    }

    pub(crate) fn ids(&self) -> impl Iterator<Item = ModelId> + '_ {
        ModelId::all(self.models.len())
    }

    /// The model a served name or alias means (`None`: no model's).
    pub(crate) fn find(&self, name: &str) -> Option<ModelId> {
        let exact = self.models.iter().position(|n| n.served() == name);
        let alias = || {
            self.models
                .iter()
                .position(|n| n.aliases().iter().any(|a| alias_matches(a, name)))
        };
        exact.or_else(alias).map(|i| ModelId(i as u8))
    }

    /// The model an operator names: a served name, an alias, or a profile.
    pub(crate) fn named(&self, name: &str) -> Option<ModelId> {
        self.find(name)
            .or_else(|| self.ids().find(|id| self.get(*id).profile().as_str() == name))
    }

    /// Whether a key's `models=` list (served names or profiles) allows model `id`.
    pub(crate) fn allows(&self, list: &[String], id: ModelId) -> bool {
        let n = self.get(id);
        list.iter().any(|a| a == n.served() || a == n.profile().as_str())
    }

    /// Which model `body` names: its served name, else the first model whose alias matches;
    /// absent, null or empty means `fallback` (the loaded one: a request that names no model
    /// never causes a swap). One model: always it (its normaliser refuses another name).
    fn pick(&self, body: &Map<String, Value>, fallback: ModelId) -> Result<ModelId, GatewayError> {
        if self.models.len() == 1 {
            return Ok(ModelId(0));
        }
        match named(body) {
            Some(Value::String(m)) if !m.is_empty() => self.find(m).ok_or_else(|| GatewayError::ModelNotFound {
                model: m.clone(),
                valid: self.valid().join(", "),
            }),
            _ => Ok(fallback),
        }
    }

    /// Every name a client may send, each model's served name first.
    pub(crate) fn valid(&self) -> Vec<String> {
        let mut valid = Vec::new();
        for n in &self.models {
            valid.push(n.served().to_owned());
            valid.extend(n.aliases().iter().cloned());
        }
        valid
    }

    /// Normalises `body` with the normaliser of the model it names.
    pub(crate) fn normalize(
        &self,
        api: Api,
        release: VllmRelease,
        body: Map<String, Value>,
        prompts: Option<u32>,
        fallback: ModelId,
    ) -> Result<Normalized, GatewayError> {
        let id = self.pick(&body, fallback)?;
        let mut norm = self.get(id).normalize(api, release, body, prompts)?;
        norm.model_id = id;
        Ok(norm)
    }

    /// Whether streams that can be continued ask vLLM for their token ids (RESUME_TIMEOUT).
    pub(crate) fn resume_streams(&self) -> bool {
        self.models[0].resume_streams
    }
}

/// The `model` vLLM reads: the deepest literal `extra_body` that names one overrides the level
/// above it, as flattening does.
fn named(body: &Map<String, Value>) -> Option<&Value> {
    let mut level = body;
    let mut found = level.field("model").filter(|v| !v.is_null());
    for _ in 0..EXTRA_BODY_DEPTH {
        let Some(Value::Object(extra)) = level.field("extra_body") else {
            break;
        };
        level = extra;
        if let Some(m) = level.field("model").filter(|v| !v.is_null()) {
            found = Some(m);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sparkgate_config::ProfileId;

    fn two() -> Catalog {
        Catalog::new(vec![
            Normalizer::new(ProfileId::DeepSeekV41Flash, "DS", &["ds-*".to_owned()], &[]),
            Normalizer::new(
                ProfileId::Glm53Flash,
                "GLM",
                &["glm".to_owned(), "claude-*".to_owned()],
                &[],
            ),
        ])
    }

    fn pick(c: &Catalog, body: Value, fallback: u8) -> Result<ModelId, GatewayError> {
        c.pick(body.as_object().unwrap(), ModelId(fallback))
    }

    #[test]
    fn a_request_names_its_model_by_served_name_alias_or_extra_body() {
        let c = two();
        assert_eq!(pick(&c, json!({"model": "GLM"}), 0).unwrap(), ModelId(1));
        assert_eq!(pick(&c, json!({"model": "ds-small"}), 1).unwrap(), ModelId(0));
        assert_eq!(pick(&c, json!({"model": "claude-sonnet-4"}), 0).unwrap(), ModelId(1));
        // The SDK flattens extra_body over the top level: its model is the one vLLM reads.
        assert_eq!(
            pick(&c, json!({"model": "DS", "extra_body": {"model": "glm"}}), 0).unwrap(),
            ModelId(1)
        );
        // No model, or an empty one: the loaded model, never a swap.
        assert_eq!(pick(&c, json!({}), 1).unwrap(), ModelId(1));
        assert_eq!(pick(&c, json!({"model": ""}), 0).unwrap(), ModelId(0));
        let e = pick(&c, json!({"model": "qwen"}), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "The model `qwen` does not exist. Valid aliases: DS, ds-*, GLM, glm, claude-*."
        );
    }

    #[test]
    fn each_model_is_normalised_by_its_own_profile() {
        let c = two();
        let body = |m: &str| {
            json!({"model": m, "messages": [], "reasoning_effort": 50})
                .as_object()
                .unwrap()
                .clone()
        };
        // DeepSeek's template takes an integer effort; GLM's only its names.
        let ds = c
            .normalize(Api::Chat, VllmRelease::V0_34, body("ds-x"), None, ModelId(1))
            .unwrap();
        assert_eq!(ds.model_id, ModelId(0));
        assert_eq!(ds.body["model"], "DS");
        let glm = c
            .normalize(Api::Chat, VllmRelease::V0_34, body("glm"), None, ModelId(0))
            .unwrap_err();
        assert_eq!(glm.param(), Some("reasoning_effort"), "{glm}");
        let glm = c
            .normalize(
                Api::Chat,
                VllmRelease::V0_34,
                body("GLM")
                    .into_iter()
                    .filter(|(k, _)| k != "reasoning_effort")
                    .collect(),
                None,
                ModelId(0),
            )
            .unwrap();
        assert_eq!((glm.model_id, glm.body["model"].as_str()), (ModelId(1), Some("GLM")));
    }
}
