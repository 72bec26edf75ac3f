//! Each rule against what the vLLM venv's pydantic 2.14 / pydantic-core 2.50 answered.

use serde_json::json;

use super::*;

fn errs(ty: &Ty, v: Value) -> Vec<(String, String, String, Option<String>)> {
    let mut errors = Vec::new();
    let mut loc = vec!["body".to_owned(), "x".to_owned()];
    check(ty, &v, &mut loc, &mut errors, Mode::Lax);
    errors
        .into_iter()
        .map(|e| (e.kind.to_owned(), e.loc, e.msg, e.ctx))
        .collect()
}

fn ok(ty: &Ty, v: Value) -> Value {
    let mut errors = Vec::new();
    let out = check(ty, &v, &mut vec!["body".into()], &mut errors, Mode::Lax);
    assert!(errors.is_empty(), "{v}: {errors:?}");
    out.unwrap()
}

fn kind(ty: &Ty, v: Value) -> String {
    errs(ty, v).first().map(|e| e.0.clone()).unwrap_or_default()
}

const INT: Ty = Ty::Int(Bounds {
    ge: None,
    gt: None,
    le: None,
    lt: None,
});

const STR: Ty = Ty::Str { min: None, max: None };

#[test]
fn integers_take_pythons_forms() {
    for (input, out) in [
        (json!("2.0"), json!(2)),
        (json!(" 3 "), json!(3)),
        (json!("1_0"), json!(10)),
        (json!("+4"), json!(4)),
        (json!(2.0), json!(2)),
        (json!(true), json!(1)),
        (json!(18446744073709551615u64), json!(18446744073709551615u64)),
    ] {
        assert_eq!(ok(&INT, input.clone()), out, "{input}");
    }
    for (input, k) in [
        ("\"2.5\"", "int_parsing"),
        ("\"1e3\"", "int_parsing"),
        ("\"\"", "int_parsing"),
        ("\"0x10\"", "int_parsing"),
        ("2.5", "int_from_float"),
        ("1e30", "int_parsing_size"),
        ("9.3e18", "int_parsing_size"),
        ("null", "int_type"),
        ("[1]", "int_type"),
    ] {
        assert_eq!(kind(&INT, serde_json::from_str(input).unwrap()), k, "{input}");
    }
}

#[test]
fn floats_and_booleans_take_pythons_forms() {
    let float = Ty::Float(Bounds::default());
    assert_eq!(ok(&float, json!("1e0")), json!(1.0));
    assert_eq!(ok(&float, json!(" 2 ")), json!(2.0));
    assert_eq!(ok(&float, json!(true)), json!(1.0));
    assert_eq!(kind(&float, json!("")), "float_parsing");
    assert_eq!(kind(&float, json!({})), "float_type");
    for (input, out) in [
        (json!(1), true),
        (json!(0.0), false),
        (json!("YES"), true),
        (json!("off"), false),
    ] {
        assert_eq!(ok(&Ty::Bool, input), json!(out));
    }
    assert_eq!(kind(&Ty::Bool, json!(2)), "bool_parsing");
    assert_eq!(kind(&Ty::Bool, json!("2")), "bool_parsing");
    assert_eq!(kind(&Ty::Bool, json!(0.5)), "bool_type");
    assert_eq!(kind(&Ty::Bool, Value::Null), "bool_type");
}

#[test]
fn bounds_render_as_pydantic_renders_them() {
    let ge0 = Ty::Int(Bounds {
        ge: Some(0.0),
        ..Bounds::default()
    });
    assert_eq!(
        errs(&ge0, json!(-1))[0],
        (
            "greater_than_equal".into(),
            "body.x".into(),
            "Input should be greater than or equal to 0".into(),
            Some("'ge': 0".into())
        )
    );
    let le2 = Ty::Float(Bounds {
        le: Some(2.0),
        ..Bounds::default()
    });
    let e = &errs(&le2, json!(3))[0];
    assert_eq!(
        (e.2.as_str(), e.3.as_deref()),
        ("Input should be less than or equal to 2", Some("'le': 2.0"))
    );
    let seed = Ty::Int(Bounds {
        le: Some(9.223372036854776e18),
        ..Bounds::default()
    });
    assert_eq!(
        errs(&seed, json!(18446744073709551615u64))[0].3.as_deref(),
        Some("'le': 9223372036854775807")
    );
}

#[test]
fn strings_lists_and_literals() {
    let salt = Ty::Str {
        min: Some(1),
        max: None,
    };
    assert_eq!(errs(&salt, json!(""))[0].2, "String should have at least 1 character");
    assert_eq!(kind(&salt, json!(1)), "string_type");
    let one = Ty::List {
        item: Box::new(INT),
        min: None,
        max: Some(1),
    };
    let e = &errs(&one, json!(["a", "b"]))[0];
    assert_eq!(e.0, "too_long");
    assert_eq!(e.2, "List should have at most 1 item after validation, not 2");
    assert_eq!(errs(&one, json!(["a"]))[0].1, "body.x.0");
    let lit = Ty::Lit(vec![json!("a"), json!("b"), json!(3)]);
    let e = &errs(&lit, json!("c"))[0];
    assert_eq!(e.2, "Input should be 'a', 'b' or 3");
    assert_eq!(e.3.as_deref(), Some("'expected': \"'a', 'b' or 3\""));
}

#[test]
fn a_union_reports_every_member_and_vllm_drops_the_internal_tags() {
    let stop = Ty::Union(vec![
        STR,
        Ty::List {
            item: Box::new(STR),
            min: None,
            max: Some(4),
        },
    ]);
    let e = errs(&stop, json!(5));
    assert_eq!(e.len(), 2);
    assert_eq!((e[0].0.as_str(), e[0].1.as_str()), ("string_type", "body.x"));
    assert_eq!((e[1].0.as_str(), e[1].1.as_str()), ("list_type", "body.x"));
    // Strictly first: a string stays a string where a union also takes an integer.
    let either = Ty::Union(vec![INT, STR]);
    assert_eq!(ok(&either, json!("5")), json!("5"));
    assert_eq!(
        clean(&["body".into(), "function-wrap[f()]".into(), "type".into()]),
        "body.type"
    );
    assert_eq!(clean(&["body".into(), "str".into()]), "body");
}

#[test]
fn models_from_the_captured_schema() {
    let chat = Ty::Ref("ChatCompletionRequest".into());
    let e = errs(&chat, json!({"messages": ["x"]}));
    assert_eq!(e.len(), 8, "{e:?}");
    assert_eq!(e[0].1, "body.x.messages.0.ChatCompletionDeveloperMessageParam");
    assert_eq!(e[7].0, "model_attributes_type");
    let e = errs(&chat, json!({}));
    assert_eq!((e[0].0.as_str(), e[0].1.as_str()), ("missing", "body.x.messages"));
    let e = errs(&chat, json!({"messages": [], "response_format": {"type": "zz"}}));
    assert_eq!(e[0].1, "body.x.response_format.type");
    assert_eq!(e.len(), 6, "{e:?}");
}
