//! Protocol types, model files, tokenizer, chat templates, Renderer and Derenderer.
