/* cpu_threads.c: placeholder until the CPU backend lands */
