# tests/models/gpt_resume_check.cmake: train_gpt --autocast fp16 --dropout 0.1, stopped and resumed,
# equals one run straight through, bit for bit, loss scale and dropout masks included (the masks'
# generator state is in the checkpoint): 3 steps, save, resume to 6 == 6 steps. On
# windows of 2 bytes the float16 gradients of a tiny model overflow at the first scale (2^16), so the
# GradScaler skips steps and changes its state before the stop. Then a checkpoint without the scaler
# state (as those saved before train_gpt kept it) resumes with a fresh scaler, and its run differs;
# so does one without the dropout generator's state.
#   cmake -DPROGRAM=<train_gpt> -DWORK=<dir> [-DLAUNCHER="kiln-run;-n;2"] -P gpt_resume_check.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/train_check.cmake)
write_test_corpus(${WORK}/corpus.txt)
set(model --n-layer 1 --n-head 2 --n-embd 32 --context 2 --batch-size 1 --autocast fp16 --dropout 0.1
          --corpus ${WORK}/corpus.txt)
set(run --eval-batches 1 --sample 0 --threads 1)

# The last line's numbers: "train loss L, validation loss V; loss scale S, K steps skipped".
function(summary out_var text)
  if(NOT text MATCHES "train loss [0-9.]+, validation loss [0-9.]+; loss scale ([0-9]+), ([0-9]+) steps skipped")
    message(FATAL_ERROR "no loss scale in:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_0}" PARENT_SCOPE)
  set(${out_var}_scale "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${out_var}_skipped "${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

# Which of the checkpoint files differ between two checkpoint directories.
function(differing out_var a b)
  set(names "")
  foreach(f model optimizer scaler)
    file(SHA256 ${a}/${f}.safetensors ha)
    file(SHA256 ${b}/${f}.safetensors hb)
    if(NOT ha STREQUAL hb)
      list(APPEND names ${f})
    endif()
  endforeach()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

# Resumes the checkpoint in ${WORK}/<dir>, expecting the loss scale `scale` at step 3 and a model at
# step 6 other than the straight run's, for the reason `why`.
function(resumes_otherwise dir scale why)
  run_program(out "${LAUNCHER}" --resume ${WORK}/${dir}/checkpoint ${run} --steps 6 --out ${WORK}/${dir})
  if(NOT out MATCHES "resumed at step 3 [(]loss scale ${scale}[)]")
    message(FATAL_ERROR "${dir}: the run should resume with the loss scale ${scale}:\n${out}")
  endif()
  differing(files ${WORK}/straight/checkpoint ${WORK}/${dir}/checkpoint)
  list(FIND files model at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${dir}: ${why} should change the run, but the model equals the straight run's")
  endif()
endfunction()

run_program(out "${LAUNCHER}" ${model} ${run} --steps 6 --out ${WORK}/straight)
summary(straight "${out}")
run_program(out "${LAUNCHER}" ${model} ${run} --steps 3 --out ${WORK}/first)
summary(first "${out}")
if(first_skipped LESS 1)
  message(FATAL_ERROR "the first 3 steps skipped none, so the scaler state at the stop is a fresh one's and "
                      "the test shows nothing; a smaller --context or --n-embd overflows sooner:\n${out}")
endif()
file(COPY ${WORK}/first/checkpoint DESTINATION ${WORK}/old)
file(COPY ${WORK}/first/checkpoint DESTINATION ${WORK}/norng)

run_program(out "${LAUNCHER}" --resume ${WORK}/first/checkpoint ${run} --steps 6 --out ${WORK}/resumed)
if(NOT out MATCHES "resumed at step 3 [(]loss scale ${first_scale}[)]")
  message(FATAL_ERROR "the resumed run should start at step 3 with the loss scale ${first_scale}:\n${out}")
endif()
summary(resumed "${out}")
# A setting given again on --resume must agree with the checkpoint's: an Error, not ignored.
execute_process(COMMAND ${LAUNCHER} ${PROGRAM} --resume ${WORK}/first/checkpoint ${run} --steps 6 --lr 0.5 --out ${WORK}/conflict
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--lr asks for lr = 0.5 but the checkpoint [(].*[)] has lr = 0.0003: a resumed run keeps")
  message(FATAL_ERROR "--lr 0.5 on --resume should be an Error naming both values, got ${rc}:\n${err}")
endif()
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "resumed: '${resumed}'\nstraight through: '${straight}'")
endif()
differing(files ${WORK}/straight/checkpoint ${WORK}/resumed/checkpoint)
if(files)
  message(FATAL_ERROR "resumed and straight through, these checkpoint files differ: ${files}")
endif()

# A checkpoint from before the scaler state was kept: no scaler.safetensors, no "scaler" in the manifest.
file(REMOVE ${WORK}/old/checkpoint/scaler.safetensors)
file(READ ${WORK}/old/checkpoint/checkpoint.json manifest)
string(REGEX REPLACE ",[ \n]*\"scaler\": \"scaler.safetensors\"" "" manifest "${manifest}")
if(manifest MATCHES "scaler")
  message(FATAL_ERROR "could not take the scaler out of the manifest:\n${manifest}")
endif()
file(WRITE ${WORK}/old/checkpoint/checkpoint.json "${manifest}")
resumes_otherwise(old 65536 "a fresh scaler at step 3 (it skips steps again)")

# A checkpoint from before the dropout generator's state was kept resumes with the masks of the
# seed's state: the run differs from straight through, the scaler's state being the same.
file(READ ${WORK}/norng/checkpoint/checkpoint.json manifest)
string(REGEX REPLACE "\"dropout_rng\": {[^}]*}," "" older "${manifest}")
if(older STREQUAL manifest)
  message(FATAL_ERROR "no dropout_rng in ${WORK}/norng/checkpoint/checkpoint.json:\n${manifest}")
endif()
file(WRITE ${WORK}/norng/checkpoint/checkpoint.json "${older}")
resumes_otherwise(norng ${first_scale} "masks from the seed's state after step 3")
