// The first entry of a slot list that a query at position qpos reads under a sliding window: the
// entry of its window's first position rounded down to p.list_align, where the list's positions
// are logical indices (entry e at list_position(0) + e) up to there, as the engine lists a window
// layer's slots; 0 without a window, or where the list's entries before that one are not all behind
// the window. So a query reads the same entries, from the same first one, whether its pass starts
// the list earlier (a pass of several tokens) or at that entry (the engine's list for the token
// alone: window_list_start), and kernels that group entries from the list's start group them alike.
// Needs p (AttentionParams) and int list_position(uint e) declared before it is included.
uint window_list_begin(int qpos, uint list_end) {
  if (p.window == 0) return 0;
  const int from = qpos + 1 - int(p.window);
  if (from <= 0) return 0;
  const uint first = uint(from) / max(p.list_align, 1u) * max(p.list_align, 1u);
  const uint base = uint(max(list_position(0), 0));
  if (first <= base) return 0;
  const uint c = first - base;
  return c < list_end && list_position(c - 1) < from ? c : 0;
}
