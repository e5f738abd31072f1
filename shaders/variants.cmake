# Every shader variant compiled into the binary: vkllm_shader(<variant name> <source> [-D...]).
vkllm_shader(fill_f32 fill.comp)

# Weight-reading kernels, one variant per weight type (shaders/common/dequant.glsl).
foreach(wtype f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k)
  string(TOUPPER ${wtype} WTYPE)
  foreach(kernel get_rows matvec matmul)
    vkllm_shader(${kernel}_${wtype} ${kernel}.comp -DWTYPE_${WTYPE})
  endforeach()
endforeach()
