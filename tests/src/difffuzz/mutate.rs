//! Requests built from the schema: a valid seed per route, then one to three mutations, each a
//! property of the route's model set to a value of a class (valid for its type, a coercible
//! form, at and beyond a bound, another type, null, a literal it does not list), a required
//! property removed, an unknown key, a streaming or `n` variant, or a transport form (the media
//! type's case and parameters, a byte-order mark, UTF-16). Seeded: a case is replayable from
//! its seed and index.

use serde_json::{json, Map, Value};

use super::schema::{bounds, literals, types, Model};

/// One change to a seed request.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// Sets a top-level property.
    Set(String, Value),
    /// Removes a top-level property.
    Remove(String),
    /// The body's bytes or headers, not its JSON.
    Transport(Transport),
}

/// How the body travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    MediaTypeUpper,
    MediaTypeCharset,
    MediaTypeText,
    ByteOrderMark,
    Utf16,
    ManyHeaders,
    /// The route asked with another method (GET, PUT, DELETE, HEAD).
    Method(&'static str),
    /// The route's path with a trailing slash.
    TrailingSlash,
}

/// A request as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    pub method: &'static str,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Mutation {
    /// The property a mutation touches (what the written lists match on).
    pub fn field(&self) -> String {
        match self {
            Mutation::Set(k, _) | Mutation::Remove(k) => k.clone(),
            Mutation::Transport(Transport::Method(_)) => "<Method>".to_owned(),
            Mutation::Transport(t) => format!("<{t:?}>"),
        }
    }
}

/// A small deterministic generator (xorshift64*): a case replays from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.draw() % n.max(1) as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.draw() % 100 < percent
    }
}

/// The routes the fuzzer drives, with a valid seed body each (`$MODEL` is the served name).
pub const ROUTES: &[(&str, &str)] = &[
    (
        "/v1/chat/completions",
        r#"{"model": "$MODEL", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}"#,
    ),
    (
        "/v1/completions",
        r#"{"model": "$MODEL", "prompt": "Say hi", "max_tokens": 4}"#,
    ),
    (
        "/v1/messages",
        r#"{"model": "$MODEL", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}"#,
    ),
    (
        "/v1/messages/count_tokens",
        r#"{"model": "$MODEL", "messages": [{"role": "user", "content": "Say hi"}]}"#,
    ),
    (
        "/v1/responses",
        r#"{"model": "$MODEL", "input": "Say hi", "max_output_tokens": 4}"#,
    ),
    ("/tokenize", r#"{"model": "$MODEL", "prompt": "Say hi"}"#),
    ("/detokenize", r#"{"model": "$MODEL", "tokens": [1, 2, 3]}"#),
];

/// Properties whose values make the engine work longer: kept small whatever the class.
const WORK: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "min_tokens",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
];

/// The mutations of one case.
pub fn mutations(rng: &mut Rng, model: &Model) -> Vec<Mutation> {
    let count = 1 + rng.below(3);
    (0..count).map(|_| one(rng, model)).collect()
}

fn one(rng: &mut Rng, model: &Model) -> Mutation {
    match rng.below(100) {
        0..=4 => Mutation::Transport(*rng.pick(&[
            Transport::MediaTypeUpper,
            Transport::MediaTypeCharset,
            Transport::MediaTypeText,
            Transport::ByteOrderMark,
            Transport::Utf16,
            Transport::ManyHeaders,
            Transport::Method("GET"),
            Transport::Method("PUT"),
            Transport::Method("DELETE"),
            Transport::Method("HEAD"),
            Transport::TrailingSlash,
        ])),
        5..=9 if !model.required.is_empty() => Mutation::Remove(rng.pick(&model.required).clone()),
        10..=12 => Mutation::Set("x_unknown_key".into(), json!(1)),
        13..=17 => Mutation::Set(
            "stream".into(),
            rng.pick(&[json!(true), json!("true"), json!(1), json!("yes"), json!(false)])
                .clone(),
        ),
        _ if model.props.is_empty() => Mutation::Set("stream".into(), json!(true)),
        _ => {
            let prop = rng.pick(&model.props).clone();
            Mutation::Set(prop.name.clone(), value(rng, &prop.name, &prop.schema))
        }
    }
}

/// A value for a property, of a class chosen at random.
fn value(rng: &mut Rng, name: &str, schema: &Value) -> Value {
    let kinds = types(schema);
    let lits = literals(schema);
    let edges = bounds(schema);
    let work = WORK.contains(&name);
    match rng.below(8) {
        0 => Value::Null,
        1 if !lits.is_empty() => rng.pick(&lits).clone(),
        1 | 2 => wrong_type(rng, &kinds),
        3 if !edges.is_empty() => {
            let edge = *rng.pick(&edges);
            let near = *rng.pick(&[-1.0, -0.5, 0.0, 0.5, 1.0]);
            number(edge + near, kinds.iter().any(|k| k == "integer"))
        }
        4 => coercible(rng, &kinds, work),
        5 if !lits.is_empty() => json!("not_a_listed_value"),
        _ => valid(rng, &kinds, work),
    }
}

fn number(v: f64, integer: bool) -> Value {
    if integer && v.fract() == 0.0 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

/// A value of the property's own type.
fn valid(rng: &mut Rng, kinds: &[String], work: bool) -> Value {
    let kind = if kinds.is_empty() {
        "string".to_owned()
    } else {
        rng.pick(kinds).clone()
    };
    match kind.as_str() {
        "integer" if work => json!(rng.pick(&[0, 1, 2, 3, -1])),
        "integer" => json!(rng.pick(&[0, 1, 2, 7, -1, 100, 1_000_000])),
        "number" => json!(rng.pick(&[0.0, 0.5, 1.0, 1.5, -0.5, 2.0, 1e9])),
        "boolean" => json!(rng.chance(50)),
        "array" => rng
            .pick(&[json!([]), json!(["x"]), json!([1]), json!(["a", "b", "c", "d", "e"])])
            .clone(),
        "object" => rng.pick(&[json!({}), json!({"k": "v"})]).clone(),
        "null" => Value::Null,
        _ => rng.pick(&[json!(""), json!("x"), json!("auto"), json!("none")]).clone(),
    }
}

/// A form pydantic's lax mode coerces (or refuses) for the property's type.
fn coercible(rng: &mut Rng, kinds: &[String], work: bool) -> Value {
    let small = if work { "2" } else { "7" };
    if kinds.iter().any(|k| k == "integer") {
        return rng
            .pick(&[
                json!(small),
                json!(2.0),
                json!(" 3 "),
                json!("2.5"),
                json!(true),
                json!("1_0"),
            ])
            .clone();
    }
    if kinds.iter().any(|k| k == "boolean") {
        return rng
            .pick(&[json!("true"), json!("no"), json!(1), json!(0), json!("maybe"), json!(2)])
            .clone();
    }
    if kinds.iter().any(|k| k == "number") {
        return rng.pick(&[json!("0.5"), json!("1e0"), json!(1), json!("nan")]).clone();
    }
    rng.pick(&[json!(1), json!(true), json!(["x"])]).clone()
}

/// A value of a type the property does not take.
fn wrong_type(rng: &mut Rng, kinds: &[String]) -> Value {
    let candidates = [
        ("string", json!("wrong")),
        ("integer", json!(3)),
        ("number", json!(0.25)),
        ("boolean", json!(false)),
        ("array", json!([1, "x"])),
        ("object", json!({"unexpected": 1})),
    ];
    let others: Vec<&Value> = candidates
        .iter()
        .filter(|(k, _)| !kinds.iter().any(|t| t == k))
        .map(|(_, v)| v)
        .collect();
    if others.is_empty() {
        json!({"unexpected": 1})
    } else {
        (*rng.pick(&others)).clone()
    }
}

/// The request `route`'s seed becomes after `mutations`.
pub fn apply(route: &str, seed: &Map<String, Value>, mutations: &[Mutation]) -> Wire {
    let mut body = seed.clone();
    let mut transports = Vec::new();
    for m in mutations {
        match m {
            Mutation::Set(k, v) => {
                body.insert(k.clone(), v.clone());
            }
            Mutation::Remove(k) => {
                body.shift_remove(k);
            }
            Mutation::Transport(t) => transports.push(*t),
        }
    }
    let mut bytes = serde_json::to_vec(&body).expect("JSON");
    let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    let (mut method, mut path) = ("POST", route.to_owned());
    for t in transports {
        match t {
            Transport::MediaTypeUpper => headers[0].1 = "Application/JSON".into(),
            Transport::MediaTypeCharset => headers[0].1 = "application/json; charset=utf-8".into(),
            Transport::MediaTypeText => headers[0].1 = "text/plain".into(),
            Transport::ByteOrderMark => bytes.splice(0..0, [0xef, 0xbb, 0xbf]).for_each(drop),
            Transport::Utf16 => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                bytes = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
            }
            Transport::ManyHeaders => headers.extend((0..120).map(|i| (format!("x-extra-{i}"), "1".to_owned()))),
            Transport::Method(m) => method = m,
            Transport::TrailingSlash => path.push('/'),
        }
    }
    Wire {
        method,
        path,
        headers,
        body: bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_cases() {
        let model = Model {
            props: vec![super::super::schema::Prop {
                name: "n".into(),
                schema: json!({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}),
            }],
            required: vec!["messages".into()],
        };
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..50).map(|_| mutations(&mut rng, &model)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn transports_change_bytes_and_headers_not_the_json() {
        let seed: Map<String, Value> = serde_json::from_str(r#"{"a": 1}"#).unwrap();
        let w = apply("/x", &seed, &[Mutation::Transport(Transport::ByteOrderMark)]);
        assert_eq!(&w.body[..3], b"\xef\xbb\xbf");
        assert_eq!(w.headers[0].1, "application/json");
        let w = apply("/x", &seed, &[Mutation::Transport(Transport::Utf16)]);
        assert_eq!(w.body.len(), 2 * r#"{"a":1}"#.len());
        let w = apply("/x", &seed, &[Mutation::Transport(Transport::ManyHeaders)]);
        assert_eq!(w.headers.len(), 121);
        let w = apply(
            "/x",
            &seed,
            &[
                Mutation::Transport(Transport::Method("GET")),
                Mutation::Transport(Transport::TrailingSlash),
            ],
        );
        assert_eq!((w.method, w.path.as_str()), ("GET", "/x/"));
    }
}
