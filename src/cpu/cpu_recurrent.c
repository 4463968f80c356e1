/* cpu_recurrent.c: placeholder until the CPU backend lands */
