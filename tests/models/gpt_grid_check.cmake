# tests/models/gpt_grid_check.cmake: train_gpt --tensor-parallel / --pipeline-parallel (models::ParallelGPT
# through kiln::Engine over a grid) on 2 ranks, with dropout 0.1 (the ranks drop what one rank drops).
#   1. Tensor parallel over 2 ranks, with and without sequence parallelism, trains as one rank
#      does: the loss of every step within 1e-5 relative (the same windows and dropout masks, the
#      same arithmetic summed in another order).
#      So does it with the blocks checkpointed and their inputs partitioned between the 2 tensor
#      ranks ("activation_checkpointing" in the DeepSpeed config).
#   2. Two pipeline stages (the head tied to the embedding across them) train as one rank does
#      too, with activation checkpointing and offload as well; stopped at step 3 and resumed, they equal a run straight through, bit for bit: the
#      loss of every step and the validation losses. A checkpoint without head_tied_across_stages
#      (an older run's) resumes untied: from a tied run's, an Error on every rank.
#   3. The sample at the end, from the model gathered onto rank 0, is one rank's.
#   4. A grid without a DeepSpeed config, with more ranks than there are, or --sequence-parallel
#      without tensor parallelism is an Error.
#   5. Interleaved 1F1B (--virtual-stages 2 on 2 pipeline ranks, dropout 0.1 too) trains as one
#      rank does, resumes exactly, and samples as one rank does.
#   cmake -DPROGRAM=<train_gpt> -DLAUNCHER="kiln-run;-n;2" -DWORK=<dir> -P gpt_grid_check.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/train_check.cmake)
write_test_corpus(${WORK}/corpus.txt)
file(WRITE ${WORK}/ds.json [=[{
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
  "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "zero_optimization": {"stage": 1}
}]=])
set(model --n-layer 2 --context 16 --dropout 0.1 --corpus ${WORK}/corpus.txt --deepspeed-config ${WORK}/ds.json)
set(run --eval-every 3 --eval-batches 1 --log-every 1 --sample 0 --threads 1 --quiet)

# 1. Tensor parallel equals one rank.
run_program(out "" ${model} ${run} --steps 6 --out ${WORK}/one)
run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --tensor-parallel 2 --out ${WORK}/tensor)
losses(one ${WORK}/one/metrics.jsonl)
losses(tensor ${WORK}/tensor/metrics.jsonl)
check_losses_close("${tensor}" "${one}" "tensor parallel's" "one rank's")
run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --tensor-parallel 2 --sequence-parallel --out ${WORK}/sequence)
losses(sequence ${WORK}/sequence/metrics.jsonl)
check_losses_close("${sequence}" "${one}" "sequence parallel's" "one rank's")
# The blocks checkpointed, each tensor rank keeping half of each block's input (DeepSpeed's
# "activation_checkpointing": partition_activations; cpu_checkpointing leaves CPU tensors where they
# are): the same losses.
file(READ ${WORK}/ds.json plain_config)
string(REPLACE "\"zero_optimization\"" "\"activation_checkpointing\": {\"partition_activations\": true, \"cpu_checkpointing\": true},\n  \"zero_optimization\""
       partitioned_config "${plain_config}")
if(partitioned_config STREQUAL plain_config)
  message(FATAL_ERROR "no \"zero_optimization\" in ${WORK}/ds.json to put the section before")
endif()
file(WRITE ${WORK}/ds-partitioned.json "${partitioned_config}")
run_program(out "${LAUNCHER}" --n-layer 2 --context 16 --dropout 0.1 --corpus ${WORK}/corpus.txt
            --deepspeed-config ${WORK}/ds-partitioned.json ${run} --steps 6 --tensor-parallel 2
            --checkpoint-activations --out ${WORK}/partitioned)
losses(partitioned ${WORK}/partitioned/metrics.jsonl)
check_losses_close("${partitioned}" "${one}" "partitioned checkpointing's" "one rank's")
if(NOT EXISTS ${WORK}/tensor/checkpoint-engine/step6/stage_0/tensor_1/zero_rank_0.safetensors)
  message(FATAL_ERROR "no engine checkpoint of tensor rank 1 in ${WORK}/tensor/checkpoint-engine/step6/stage_0")
endif()

# 2. Two stages equal one rank; stopped and resumed, they equal straight through.
run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --pipeline-parallel 2 --out ${WORK}/straight)
run_program(out "${LAUNCHER}" ${model} ${run} --steps 3 --pipeline-parallel 2 --out ${WORK}/stopped)
run_program(out "${LAUNCHER}" --resume ${WORK}/stopped/checkpoint ${run} --steps 6 --out ${WORK}/stopped)
losses(pipeline ${WORK}/straight/metrics.jsonl)
check_losses_close("${pipeline}" "${one}" "two stages'" "one rank's")
# With every block checkpointed (recomputed in backward, its dropout masks replayed) and the saved
# activations offloaded (on a CPU model they stay where they are): the same losses.
run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --pipeline-parallel 2 --checkpoint-activations
            --offload-activations --out ${WORK}/recomputed)
losses(recomputed ${WORK}/recomputed/metrics.jsonl)
check_losses_close("${recomputed}" "${one}" "two checkpointed stages'" "one rank's")
file(STRINGS ${WORK}/straight/metrics.jsonl straight)
file(STRINGS ${WORK}/stopped/metrics.jsonl resumed)
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "resumed:\n${resumed}\nstraight through:\n${straight}")
endif()
list(LENGTH straight n)
if(NOT n EQUAL 8)  # 6 step lines, 2 validation lines
  message(FATAL_ERROR "expected 8 lines in the metrics, got ${n}:\n${straight}")
endif()
# A checkpoint of a run from before the head stayed tied across stages has no
# head_tied_across_stages and resumes with an untied head: here (a tied run's, the key taken out)
# the models differ, and every rank stops with an Error rather than waiting for the stage that
# cannot load.
file(COPY ${WORK}/stopped/ DESTINATION ${WORK}/older)
file(READ ${WORK}/older/checkpoint/checkpoint.json manifest)
string(REPLACE "\"head_tied_across_stages\": true," "" older "${manifest}")
if(older STREQUAL manifest)
  message(FATAL_ERROR "no head_tied_across_stages in ${WORK}/older/checkpoint/checkpoint.json:\n${manifest}")
endif()
file(WRITE ${WORK}/older/checkpoint/checkpoint.json "${older}")
execute_process(COMMAND ${LAUNCHER} ${PROGRAM} --resume ${WORK}/older/checkpoint ${run} --steps 8 --out ${WORK}/older
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0 OR NOT err MATCHES "trainable elements")
  message(FATAL_ERROR "an untied head resumed from a tied checkpoint should be an Error on every rank, got ${rc}:\n${err}")
endif()

# 3. The sample at the end comes from the whole model, gathered from the stages and slices onto
#    rank 0: after the same training, drawn from the same generator, it is one rank's.
set(sampled --eval-batches 1 --threads 1 --quiet --sample 24 --top-k 0 --prompt "The " --steps 2)
run_program(out "" ${model} ${sampled} --out ${WORK}/sample-one)
run_program(out "${LAUNCHER}" ${model} ${sampled} --tensor-parallel 2 --out ${WORK}/sample-tensor)
run_program(out "${LAUNCHER}" ${model} ${sampled} --pipeline-parallel 2 --out ${WORK}/sample-pipeline)
# Read as hex: the bytes drawn may be any of 256, a NUL or a ';' among them.
file(READ ${WORK}/sample-one/sample.txt one_sample HEX)
string(LENGTH "${one_sample}" n)
if(NOT n EQUAL 58)  # "The ", 24 bytes and a newline: 29 bytes
  message(FATAL_ERROR "one rank's sample should be 29 bytes, got ${one_sample} (hex)")
endif()
foreach(grid tensor pipeline)
  file(READ ${WORK}/sample-${grid}/sample.txt grid_sample HEX)
  if(NOT grid_sample STREQUAL one_sample)
    message(FATAL_ERROR "the ${grid}-parallel run's sample ${grid_sample} (hex) is not one rank's ${one_sample}")
  endif()
endforeach()

# 4. Errors.
execute_process(COMMAND ${PROGRAM} --n-layer 2 --corpus ${WORK}/corpus.txt --tensor-parallel 2 --steps 1 --out ${WORK}/e1
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "train through the engine: give a --deepspeed-config too")
  message(FATAL_ERROR "--tensor-parallel without a DeepSpeed config should be an Error, got ${rc}:\n${err}")
endif()
execute_process(COMMAND ${PROGRAM} ${model} --pipeline-parallel 2 --steps 1 --out ${WORK}/e2
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "1 ranks do not make a grid of tensor 1 x pipeline 2")
  message(FATAL_ERROR "a grid larger than the ranks should be an Error, got ${rc}:\n${err}")
endif()
execute_process(COMMAND ${PROGRAM} ${model} --sequence-parallel --steps 1 --out ${WORK}/e3
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "give --tensor-parallel 2 or more")
  message(FATAL_ERROR "--sequence-parallel without tensor parallelism should be an Error, got ${rc}:\n${err}")
endif()

# 5. Interleaved 1F1B: two pipeline ranks of two chunks each (4 blocks, dropout 0.1: each rank
#    runs its chunks' forwards out of micro-batch order, and the masks are still one rank's) train
#    as one rank does; stopped at step 3 and resumed, they equal a run straight through; the sample,
#    gathered from the chunks, is one rank's. Chunks without a pipeline, and more stages than blocks
#    are Errors.
set(deep --n-layer 4 --context 16 --dropout 0.1 --corpus ${WORK}/corpus.txt --deepspeed-config ${WORK}/ds.json)
set(interleaved --pipeline-parallel 2 --virtual-stages 2)
run_program(out "" ${deep} ${run} --steps 6 --out ${WORK}/deep-one)
run_program(out "${LAUNCHER}" ${deep} ${run} --steps 6 ${interleaved} --out ${WORK}/interleaved)
run_program(out "${LAUNCHER}" ${deep} ${run} --steps 3 ${interleaved} --out ${WORK}/interleaved-stopped)
run_program(out "${LAUNCHER}" --resume ${WORK}/interleaved-stopped/checkpoint ${run} --steps 6
            --out ${WORK}/interleaved-stopped)
losses(deep_one ${WORK}/deep-one/metrics.jsonl)
losses(chunked ${WORK}/interleaved/metrics.jsonl)
check_losses_close("${chunked}" "${deep_one}" "interleaved 1F1B's" "one rank's")
file(STRINGS ${WORK}/interleaved/metrics.jsonl straight)
file(STRINGS ${WORK}/interleaved-stopped/metrics.jsonl resumed)
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "interleaved, resumed:\n${resumed}\nstraight through:\n${straight}")
endif()
# eval_batch through the chunks: the validation losses are the 1-chunk pipeline's.
run_program(out "${LAUNCHER}" ${deep} ${run} --steps 6 --pipeline-parallel 2 --out ${WORK}/deep-pipeline)
metric_values(val_chunked ${WORK}/interleaved/metrics.jsonl "val_loss")
metric_values(val_pipeline ${WORK}/deep-pipeline/metrics.jsonl "val_loss")
check_losses_close("${val_chunked}" "${val_pipeline}" "interleaved 1F1B's validation" "1F1B's validation")
# A resumed run keeps its number of chunks.
execute_process(COMMAND ${LAUNCHER} ${PROGRAM} --resume ${WORK}/interleaved-stopped/checkpoint ${run} --steps 8
                --virtual-stages 1 --out ${WORK}/interleaved-stopped RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0 OR NOT err MATCHES "--virtual-stages asks for virtual_stages = 1 but the checkpoint")
  message(FATAL_ERROR "another --virtual-stages on --resume should be an Error, got ${rc}:\n${err}")
endif()
if(NOT EXISTS ${WORK}/interleaved/checkpoint-engine/step6/stage_1/zero_rank_0.safetensors)
  message(FATAL_ERROR "no engine checkpoint of pipeline rank 1 in ${WORK}/interleaved/checkpoint-engine/step6")
endif()
run_program(out "" ${deep} ${sampled} --out ${WORK}/sample-deep-one)
run_program(out "${LAUNCHER}" ${deep} ${sampled} ${interleaved} --out ${WORK}/sample-interleaved)
file(READ ${WORK}/sample-deep-one/sample.txt one_sample HEX)
file(READ ${WORK}/sample-interleaved/sample.txt chunked_sample HEX)
string(LENGTH "${one_sample}" n)
if(NOT n EQUAL 58 OR NOT chunked_sample STREQUAL one_sample)
  message(FATAL_ERROR "the interleaved run's sample ${chunked_sample} (hex) is not one rank's ${one_sample}")
endif()
execute_process(COMMAND ${PROGRAM} ${deep} --virtual-stages 2 --steps 1 --out ${WORK}/e5
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "give --pipeline-parallel 2 or more")
  message(FATAL_ERROR "--virtual-stages without a pipeline should be an Error, got ${rc}:\n${err}")
endif()
execute_process(COMMAND ${LAUNCHER} ${PROGRAM} ${deep} --pipeline-parallel 2 --virtual-stages 3 --steps 1
                --out ${WORK}/e6 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0 OR NOT err MATCHES "= 6 stages, and the model has 4 blocks")
  message(FATAL_ERROR "more stages than blocks should be an Error, got ${rc}:\n${err}")
endif()
