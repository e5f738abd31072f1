// fill: dst[i] = value for i < n. The smoke-test shader of the build pipeline.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "params.h"

layout(local_size_x_id = 0) in;
layout(binding = 0) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform Push { FillParams p; };

void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) dst[i] = p.value;
}
