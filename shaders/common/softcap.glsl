// tanh for soft-capping and GELU, without the overflow of exp(2|v|) for large |v|.
#ifndef VKLLM_SOFTCAP_GLSL
#define VKLLM_SOFTCAP_GLSL

float safe_tanh(float v) {
  const float e = exp(-2.0 * abs(v));
  return sign(v) * (1.0 - e) / (1.0 + e);
}

#endif
