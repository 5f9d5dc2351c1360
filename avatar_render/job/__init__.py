"""One render job, from its request to the output moved into place: the set-up every process of a
launch shares (setup), the chunk loop with the writer and the journal (loop), the output's paths and
ownership (output), the resume journal (journal, resume) and clean stops (stop)."""
