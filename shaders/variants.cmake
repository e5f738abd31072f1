# Every shader variant compiled into the binary: vkllm_shader(<variant name> <source> [-D...]).
vkllm_shader(fill_f32 fill.comp)

# Weight-reading kernels, one variant per weight type (shaders/common/dequant.glsl).
foreach(wtype f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs)
  string(TOUPPER ${wtype} WTYPE)
  foreach(kernel get_rows matvec matmul)
    vkllm_shader(${kernel}_${wtype} ${kernel}.comp -DWTYPE_${WTYPE})
  endforeach()
endforeach()

# matvec with x as 8-bit blocks (integer dot products; MatvecTuning::q8x) and the kernel that
# writes them.
foreach(wtype q4_0 q4_1 q8_0 q4_k q5_k q6_k)
  string(TOUPPER ${wtype} WTYPE)
  vkllm_shader(matvec_q8x_${wtype} matvec.comp -DWTYPE_${WTYPE} -DX_Q8)
endforeach()
vkllm_shader(quantize_x quantize_x.comp)

# The CPU-driver matvec (matvec_simd.comp) for the types it covers.
foreach(wtype f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs)
  string(TOUPPER ${wtype} WTYPE)
  vkllm_shader(matvec_simd_${wtype} matvec_simd.comp -DWTYPE_${WTYPE})
endforeach()
vkllm_shader(matvec_simd_q4_0_x64 matvec_simd.comp -DWTYPE_Q4_0 -DX64_QUADS)

# `bench --ops`'s read ceiling: the same bytes streamed with no arithmetic.
vkllm_shader(read_ceiling read_ceiling.comp)
vkllm_shader(read_ceiling_texel read_ceiling.comp -DTEXEL)

# Element-wise and row kernels.
vkllm_shader(add binary.comp -DOP_ADD)
vkllm_shader(mul binary.comp -DOP_MUL)
vkllm_shader(scale unary.comp -DOP_SCALE)
vkllm_shader(swiglu unary.comp -DOP_SWIGLU)
vkllm_shader(geglu unary.comp -DOP_GEGLU)
vkllm_shader(softcap unary.comp -DOP_SOFTCAP)
vkllm_shader(rms_norm rms_norm.comp)
vkllm_shader(rms_norm_texel rms_norm.comp -DTEXEL_ROWS)
vkllm_shader(softmax softmax.comp -DOP_SOFTMAX)
vkllm_shader(argmax softmax.comp -DOP_ARGMAX)
vkllm_shader(log_softmax softmax.comp -DOP_LOG_SOFTMAX)
vkllm_shader(rope_table rope_table.comp)

# KV cache kernels, one variant per cache type.
foreach(ctype f16 q8_0 q4_0)
  string(TOUPPER ${ctype} CTYPE)
  vkllm_shader(kv_store_${ctype} kv_store.comp -DCACHE_${CTYPE})
  vkllm_shader(attention_${ctype} attention.comp -DCACHE_${CTYPE})
  vkllm_shader(attention_simd_${ctype} attention_simd.comp -DCACHE_${CTYPE})
  vkllm_shader(attention_lanes_${ctype} attention_lanes.comp -DCACHE_${CTYPE})
  vkllm_shader(attention_scores_${ctype} attention_decode.comp -DCACHE_${CTYPE} -DOP_SCORES)
  vkllm_shader(attention_values_${ctype} attention_decode.comp -DCACHE_${CTYPE} -DOP_VALUES)
endforeach()
vkllm_shader(attention_combine attention_combine.comp)
# The rotated copy of K (f16 caches, CPU drivers): stored with K, rebuilt from the cache, read by
# the decode kernel's scores pass.
vkllm_shader(kv_store_f16_rot kv_store.comp -DCACHE_F16 -DROT_COPY)
# One token of each of several sequences, each into its own f16 cache (a batched decode step).
vkllm_shader(kv_store_f16_batch kv_store.comp -DCACHE_F16 -DBATCH)
vkllm_shader(kv_store_f16_rot_batch kv_store.comp -DCACHE_F16 -DROT_COPY -DBATCH)
vkllm_shader(attention_lanes_f16_batch attention_lanes.comp -DCACHE_F16 -DBATCH)
vkllm_shader(kv_rotate kv_rotate.comp)
vkllm_shader(attention_scores_f16_rot attention_decode.comp -DCACHE_F16 -DOP_SCORES -DROT_COPY)
