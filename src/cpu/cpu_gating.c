/* cpu_gating.c: placeholder until the CPU backend lands */
