//! Hand-written OpenAPI schemas for the few wire fields whose Rust type says less than the
//! wire does: `serde_json::Value` fields with a known shape, values a custom deserializer
//! widens (`logprobs: true`), literals that discriminate a body (`stream`), and untagged
//! enums whose variants overlap (`prompt: []` reads as every list form), which must be an
//! `anyOf` — a `oneOf` would reject the values serde accepts through its first match.
//!
//! Everything else derives [`utoipa::ToSchema`] next to its `Deserialize`/`Serialize`.
use utoipa::openapi::schema::{
    AnyOfBuilder, ArrayBuilder, ArrayItems, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::RefOr;

fn ty(t: Type) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(t)
}

fn null() -> ObjectBuilder {
    ty(Type::Null)
}

/// `schema` or `null`.
pub fn nullable(schema: impl Into<RefOr<Schema>>) -> Schema {
    OneOfBuilder::new().item(null()).item(schema).into()
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"`, or a named function
/// `{"type": "function", "function": {"name": …}}`; `null` means the default.
pub fn tool_choice() -> Schema {
    let named = ty(Type::Object)
        .property(
            "type",
            ty(Type::String).enum_values(Some(["function"])).build(),
        )
        .property(
            "function",
            ty(Type::Object)
                .property("name", ty(Type::String))
                .required("name"),
        )
        .required("function");
    nullable(
        OneOfBuilder::new()
            .item(ty(Type::String).enum_values(Some(["none", "auto", "required"])))
            .item(named),
    )
}

/// `sampling_params.max_tokens`: absent (or `null`) means "fill the context", capped by the
/// model's `max_new_tokens` (`api.md` §10) — not the `SamplingParams` default of 16.
pub fn max_tokens() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .description(Some(
            "Absent: the rest of the context, capped by generation_config's `max_new_tokens`.",
        ))
        .into()
}

/// `output_mode` of a generate request: `"tokens"` (default), `"text"` or `"derender"`.
pub fn output_mode() -> Schema {
    ty(Type::String)
        .enum_values(Some(["tokens", "text", "derender"]))
        .default(Some("tokens".into()))
        .into()
}

/// A tool call's `arguments`: a JSON-encoded string, normally; an object is accepted too.
pub fn arguments() -> Schema {
    OneOfBuilder::new()
        .item(ty(Type::String))
        .item(ty(Type::Object))
        .description(Some(
            "The arguments as a JSON string (an object is accepted too).",
        ))
        .into()
}

/// `logprobs` / `prompt_logprobs` of `sampling_params`: an integer, `true`/`false` (read as
/// 1/0, as pydantic does), or `null`.
pub fn int_or_bool() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::Integer,
            Type::Boolean,
            Type::Null,
        ]))
        .into()
}

/// `prompt_embeds`: one base64 string or a list of them (refused by this server).
pub fn prompt_embeds() -> Schema {
    nullable(
        OneOfBuilder::new()
            .item(ty(Type::String))
            .item(ArrayBuilder::new().items(ty(Type::String))),
    )
}

/// `token_offsets`: `[[start, end], …]` character offsets, or `null`.
pub fn token_offsets() -> Schema {
    let int = || ty(Type::Integer).minimum(Some(0)).build();
    let pair = ArrayBuilder::new()
        .prefix_items([int(), int()])
        .items(ArrayItems::False)
        .min_items(Some(2))
        .max_items(Some(2));
    nullable(ArrayBuilder::new().items(pair))
}

/// The `stream` literal that tells a derender body's two forms apart: `true` for the
/// streaming form (required there); `false` or absent for the full one.
pub fn stream_true() -> Schema {
    ty(Type::Boolean).enum_values(Some([true])).into()
}

/// See [`stream_true`].
pub fn stream_false() -> Schema {
    ty(Type::Boolean).enum_values(Some([false])).into()
}

/// A `$ref` to `T`'s component schema.
pub fn reference<T: utoipa::ToSchema>() -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name(T::name()))
}

/// `anyOf` of `items`.
pub fn any_of(items: impl IntoIterator<Item = RefOr<Schema>>, description: &str) -> Schema {
    let mut b = AnyOfBuilder::new().description(Some(description));
    for i in items {
        b = b.item(i);
    }
    b.into()
}

/// `oneOf` of `items`.
pub fn one_of(items: impl IntoIterator<Item = RefOr<Schema>>, description: &str) -> Schema {
    let mut b = OneOfBuilder::new().description(Some(description));
    for i in items {
        b = b.item(i);
    }
    b.into()
}

/// Pushes `T` and the schemas it refers to (for a hand-written [`utoipa::ToSchema::schemas`]).
pub fn collect<T: utoipa::ToSchema>(out: &mut Vec<(String, RefOr<Schema>)>) {
    out.push((T::name().into_owned(), T::schema()));
    T::schemas(out);
}
