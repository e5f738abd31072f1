# Every shader variant compiled into the binary: vkllm_shader(<variant name> <source> [-D...]).
vkllm_shader(fill_f32 fill.comp)
