/* cpu_chunk.c: placeholder until the CPU backend lands */
